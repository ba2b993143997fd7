"""Validation: predictions against published measurements, calibration of the efficiency factors."""

from dse.catalog.calibration import load_fitted
from dse.validate.calibration import (
    FITTED,
    FIXED_POINT_TOL,
    Calibration,
    ServingRows,
    calibrate,
    fit,
    load_serving_rows,
    write_calibration,
)
from dse.validate.cases import Cases, Point, Skipped, TrainPoint, cases_path, load_cases
from dse.validate.predict import predict, predict_training, summarize, table
from dse.validate.published import load_published
from dse.validate.run import Validation, run_validation, write_validation_report

__all__ = [
    "FITTED", "FIXED_POINT_TOL", "Calibration", "Cases", "Point", "ServingRows", "Skipped", "TrainPoint",
    "Validation", "calibrate", "cases_path", "fit", "load_cases", "load_fitted", "load_published",
    "load_serving_rows", "predict", "predict_training", "run_validation", "summarize", "table", "write_calibration",
    "write_validation_report",
]
