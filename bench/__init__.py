"""Side-by-side benchmarks (docs/reference.md §12). Each module runs as
``python bench/NAME.py [--quick]``.

This file makes ``bench`` a package for type checkers, so that ``bench/http.py`` is the module
``bench.http`` and does not shadow the standard library's ``http``.
"""
