"""One click command per module. Heavy imports (bcc, pynvml, torch) stay inside the command."""
