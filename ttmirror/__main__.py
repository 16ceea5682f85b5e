"""python -m ttmirror"""

from .cli import run

run()
