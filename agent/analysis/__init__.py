"""Pure analyses over Evidence that more than one rule needs (no command, no file, no host access)."""
