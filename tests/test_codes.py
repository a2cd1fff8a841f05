from __future__ import annotations

from sessionstore import errors
from sessionstore.wire.codes import ErrorCode


def test_every_error_code_has_exactly_one_client_exception() -> None:
    assert set(errors.ERROR_CLASSES) == set(ErrorCode)
    for code, cls in errors.ERROR_CLASSES.items():
        assert cls.code == code and issubclass(cls, errors.SessionStoreError)
        raised = errors.error_from_wire({"code": str(code), "message": "m", "x": 1})
        assert type(raised) is cls and raised.details == {"x": 1}
