"""The app's components: fedforge's Flower apps, reading a relative ``fedforge-config`` from
this folder (which Flower ships with the app to every machine)."""

from pathlib import Path

from fedforge.flower import app, secagg

HERE = Path(__file__).resolve().parent

server = app.server_for(HERE)
client = app.client_for(HERE)

# SecAgg+ (at least 3 nodes per round): serverapp = "fedforge_app:secagg_server",
# clientapp = "fedforge_app:secagg_client"
secagg_server = secagg.server_for(HERE)
secagg_client = secagg.client_for(HERE)
