from trainprobe.agent import entry

entry()
