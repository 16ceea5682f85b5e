"""python -m ttmirror.cli"""

from ttmirror.cli import run

run()
