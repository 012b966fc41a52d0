"""The programs: the CLI (`python -m explorer`), JupyterLab and app-mode launchers, doctor,
trace, the side-by-side comparison and the attach command. The top layer: it may import
every other, and nothing imports it."""
