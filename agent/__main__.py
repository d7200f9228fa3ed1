from agent import entry

entry()
