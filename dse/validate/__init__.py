"""Validation: predictions against published measurements and measured serving runs, calibration of the
efficiency factors.

One module per job: `points` (what a measurement becomes), `cases`, `published` and `runs` (reading them),
`predict` (the physics' predictions), `decode` (a decode pass as a function of the factors), `factors` (the
factor table), `fit` (every fit), `calibration` (the catalog's `--fit`), `training` (the training runs: read,
predicted, fitted and stored apart from the serving factors), `run` (the validations) and `report` (what they
write).
"""

from dse.catalog.calibration import load_fitted
from dse.validate.calibration import FIXED_POINT_TOL, Calibration, calibrate, load_serving_rows
from dse.validate.cases import cases_path, load_cases
from dse.validate.decode import ServingRows
from dse.validate.factors import FITTED
from dse.validate.fit import fit
from dse.validate.points import Cases, Point, Skipped
from dse.validate.predict import predict, table
from dse.validate.published import load_published
from dse.validate.report import (
    RunsValidation,
    Validation,
    summarize,
    write_calibration,
    write_runs_report,
    write_validation_report,
)
from dse.validate.run import run_validation, validate_file
from dse.validate.training import (
    TrainRun,
    calibrate_training,
    load_training_runs,
    write_training_calibration,
)
from dse.validate.training import (
    predict_runs as predict_training,
)

__all__ = [
    "FITTED", "FIXED_POINT_TOL", "Calibration", "Cases", "Point", "RunsValidation", "ServingRows", "Skipped",
    "TrainRun", "Validation", "calibrate", "calibrate_training", "cases_path", "fit", "load_cases", "load_fitted",
    "load_published", "load_serving_rows", "load_training_runs", "predict", "predict_training", "run_validation",
    "summarize", "table", "validate_file", "write_calibration", "write_runs_report", "write_training_calibration",
    "write_validation_report",
]
