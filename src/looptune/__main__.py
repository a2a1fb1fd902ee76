"""``python -m looptune`` is the ``looptune`` command."""

from looptune.cli.main import main

if __name__ == "__main__":
    raise SystemExit(main())
