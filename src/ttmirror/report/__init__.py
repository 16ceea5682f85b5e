"""What reviewers read: `check`'s report (`check.py`), the projected views of the state graph
(`views.py`) and their drawings (`render.py`), the review site (`site.py`, its `templates/` and
`assets/`), and the generated parts of the spec (`specdoc.py`)."""
