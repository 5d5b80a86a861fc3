"""Records: the tuning database, measurement values and the replay context."""
from tritune.records.database import BestRow, Database, DatabaseError
from tritune.records.result import DeviceKey, MeasureResult, Status

__all__ = ["BestRow", "Database", "DatabaseError", "DeviceKey", "MeasureResult", "Status"]
