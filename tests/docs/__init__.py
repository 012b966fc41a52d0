"""Tests of the documentation site (make docs)."""
