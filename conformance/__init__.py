"""TE's own tests run against this package (``python -m conformance``, ``make
te-conformance``).

``symbols`` says what each TE name becomes, ``rewrite`` rewrites a test file's TE
imports and device, ``analysis`` finds the tests that reach a TE internal, ``runner``
prepares the folder and runs pytest with the plugin of ``shim/``, and ``report`` folds
the results and renders docs/te_conformance.md. TE's files are read from a TE checkout
and never stored here. Not installed with the package: a tool that imports it.
"""
