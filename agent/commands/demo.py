"""placeholder"""
import click
@click.command("demo")
def command():
    pass
