# The native v2 record MAC (_seal.c); optional: seal.py falls back to Python without it.

def keyed_state(secret: bytes, /) -> bytes: ...
def mac_v2(
    state: bytes,
    run_id: str,
    seq: int,
    type_: str,
    key: str | None,
    payload: str,
    value: str | None,
    created_at: float,
    prev_mac: str,
    /,
) -> str: ...
