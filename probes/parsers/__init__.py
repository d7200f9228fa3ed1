"""Pure parsers of what probes read (/proc, perf, py-spy, sysfs) and the hardware facts table."""
