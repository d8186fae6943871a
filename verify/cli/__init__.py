"""The ``ortho-verify`` command: its entry point, argument handling and the timings its help quotes.

- ``console``: the entry point of ``[project.scripts]`` and ``python -m ortho_verify``;
- ``main``: the command itself (``main(argv)``) and its subcommands;
- ``arguments``: typo suggestions and path checks shared by the commands;
- ``measured``: the timings read from ``timings.json`` beside it (written by ``scripts/timings.py``).
"""
