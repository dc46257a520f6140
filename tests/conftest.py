"""Pytest configuration: make ``tests/helpers.py`` importable as ``helpers``."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
