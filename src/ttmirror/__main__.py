"""python -m ttmirror"""

from ttmirror.cli import run

run()
