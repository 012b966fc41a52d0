"""The programs: the CLI (`python -m explorer`), JupyterLab and app-mode launchers, doctor,
trace, the side-by-side comparison and the attach command, and `explorer.Dashboard` (the ui's
Dashboard with the export as its run writer). The top layer: it may import every other, and
only `explorer/__init__.py`, which names what users import, imports it."""
