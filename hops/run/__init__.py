"""The app around the library: `python -m hops.run` (Hydra), its MLflow runs, sweep tables,
run directories and terminal progress. The core library never imports from here."""
