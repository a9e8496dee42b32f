"""Named, seeded experiments that run the policies in the simulator (docs/DESIGN.md §4).

``gshare experiment run NAME`` looks an experiment up in ``registry`` and writes its results with
``results.write_result``. Each experiment lives in its own module and registers itself.
"""
