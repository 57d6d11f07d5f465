"""The built-in methods, one folder each.

A folder holds everything of one method: ``functional.py`` (its functional twin, the pure tensor
math), ``module.py`` (its :class:`~torch.nn.Module`), ``spec.py`` (its :class:`~geograph.spec.MethodSpec`
named ``SPEC``: parameters and bounds, how it is built, score range, warm-up, bench reference and the
hand-written part of its page), ``bench.py`` where it has a slow reference, ``command.py`` where it
has a benchmark of its own (``geograph bench <name>``, named by the spec's ``bench_command``; the one
module of a folder that may import the bench helpers and the pipeline, and that nothing imports),
``updates.py`` where its corpus can be updated in place, and any further math of its own.
:mod:`geograph.registry` lists the folders of this package and reads each ``spec.SPEC``; an
installed distribution adds a method the same way through the ``geograph.methods`` entry-point
group (``docs/guide/adding-a-method.md``).
"""
