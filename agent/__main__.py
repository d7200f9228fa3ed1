from agent.cli import run

run()
