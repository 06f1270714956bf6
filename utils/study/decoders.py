"""The decoders a study scores, in one table (bench/study.py, bench/study_report.py and utils/study/analysis.py read
it from here).

``DECODERS`` (name -> beam size): what every study scores and reports in its tables unless ``--decoders`` says
otherwise: beam 5 (the primary family's) and greedy (exploratory). ``LENGTH_DECODER``: beam 5 with a length floor
chosen per system on validation data, a declared secondary that a study scores only when ``--decoders`` names it
(utils/study/length_control.py).
"""

DECODERS: dict[str, int] = {"beam5": 5, "greedy": 1}
LENGTH_DECODER = "beam5-minlen"
