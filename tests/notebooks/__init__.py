"""Tests that execute the notebooks headless."""
