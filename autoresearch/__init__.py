"""autoresearch: the calibration loop around HOPS (validate, observe, propose/gate/admit/park/revert, noise, search, log).

The package import is kept empty on purpose: `python -m autoresearch --help`
and the split guard must work without loading pandas or the simulator, and a
function re-exported under the name of its submodule (`validate`) would be
shadowed by that submodule. Use `from autoresearch.validate import validate`.
"""
