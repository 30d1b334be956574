"""The chaos suite: scenarios inject faults into a fleet of workers on one shared jail, the run is
journalled as a history (gpujail/history.py), `chaos.checker` judges the history (SPEC section 6)
and `chaos.timeline` draws it for people."""
