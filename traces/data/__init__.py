"""Bundled trace excerpts: data files only (a package so that setuptools ships them plainly)."""
