"""What a person sees in JupyterLab: views (history entries -> panel states, plain data),
captions (a step in words), presets, and the Dashboard that binds the panels (widgets/) to a
Session. Imports core and the panels; never the export or the apps."""
