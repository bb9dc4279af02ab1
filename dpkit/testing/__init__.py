"""Tooling for tests, kept out of the runtime: ``import dpkit`` never imports this package.

- :mod:`dpkit.testing.placement_check`: CPU lanes that live apart from plain CPU memory, so
  code that forgets to put its model or data on the devices fails on a laptop as on a GPU.
"""
