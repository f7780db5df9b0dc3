"""``python -m neardup_store`` runs the ``neardup-admin`` command line."""

from .cli import main

main()
