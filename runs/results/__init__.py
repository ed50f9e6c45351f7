"""Read models of a plan's results: what the pages, the API and the result comment show.

``summary`` writes the plan's summary once every run is terminal; ``run_table`` builds the
run table, ``ladder`` the scaling ladder and its fits, ``seeds`` the spread over seeds,
``presentation`` how a run and its numbers are shown, ``charts_png`` the loss chart as a PNG.
"""
