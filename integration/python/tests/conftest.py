"""Makes the package (integration/python) and the tests' helpers
importable when pytest runs from any folder."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
for p in (os.path.dirname(HERE), HERE):
    if p not in sys.path:
        sys.path.insert(0, p)
