"""A griffe extension (mkdocs.yml: mkdocstrings' `extensions`): the API pages show the docstring that a class
decorated with `trl_nca.trainers.field_docs.document_fields` has at run time, its fields' help texts included. griffe
reads the source without running it, so it would otherwise show the written part only."""

from __future__ import annotations

import inspect

import griffe


class RuntimeDocstrings(griffe.Extension):
    def on_class(self, *, cls: griffe.Class, **kwargs) -> None:
        if not any(d.callable_path.endswith("document_fields") for d in cls.decorators):
            return
        written = cls.docstring
        cls.docstring = griffe.Docstring(
            inspect.cleandoc(griffe.dynamic_import(cls.path).__doc__),
            lineno=written.lineno if written else None,
            endlineno=written.endlineno if written else None,
            parent=cls,
            parser=written.parser if written else None,
            parser_options=written.parser_options if written else None,
        )
