from fedforge.cli import app

app()
