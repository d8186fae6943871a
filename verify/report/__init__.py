"""What a run of the judge reports: result types, the terminal output and the report files.

- ``results``: ``CheckResult``, the verdict, ``VerificationReport``, ``report.json`` / ``report.md``;
- ``terminal``: the terminal summary and tables (rich);
- ``tables``: the tables quoted in the docs (``python -m ortho_verify.report.tables``);
- ``plots``: the PNG plots (matplotlib);
- ``junit``: JUnit XML; ``annotations``: GitHub Actions annotations;
- ``baseline``: regression baselines (``ortho-verify --baseline``).
"""
