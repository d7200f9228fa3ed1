"""What probes share beyond parsing: the target's facts, NVML and bcc access, source lines, job discovery."""
