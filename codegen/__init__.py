"""Build-time generator: annotated argument bundles -> checked-in custom-op glue.

Layers, one IR between them (see ``model``):

* ``reader``  reads op modules statically with libcst (never imports them), through
  ``parsing`` (decode, parse, the libcst budget), ``names`` (static name resolution),
  ``bundle_reader`` (bundle classes) and ``declaration_reader`` (op declarations);
* ``kinds``   the field-kind rules, pure functions of an annotation;
* ``emit``    builds template contexts from the IR;
* ``render``  lays them out with Jinja2 and formats with the pinned ruff;
* ``output``  writes only what changed, or compares (``--check``/``--diff``);
* ``exports`` reads the package's ``_EXPORTS`` (with ``ast``) for the typing imports and
  the ``__init__.py`` of the configured subpackages;
* ``cli``     the ``python -m codegen`` entry point.

It needs only the standard library, jinja2, libcst and ruff: torch and the
project's runtime are never imported.
"""

FORMAT_VERSION = 1
