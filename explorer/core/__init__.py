"""The explorer's model: a Session that drives one engine (or follows one) step by step and
keeps its history, the engine protocol it speaks, and the history's codecs. Imports the
drivers below it (lazily) and the engine; never the UI, the export or the apps above it."""
