"""Reading a user's .npz of plain arrays within `data.limits`: each member's size is checked from the archive's
directory and its array header before a byte of it is inflated or allocated."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
from numpy.lib import format as npy

from collabalign.data.errors import DataError, unreadable
from collabalign.data.limits import read_limits

_HEADERS = {(1, 0): npy.read_array_header_1_0, (2, 0): npy.read_array_header_2_0}


def read_npz(path: str | Path) -> dict[str, np.ndarray]:
    """The arrays of an .npz (name -> array, no pickles); a file that is not a whole .npz of plain arrays, or whose
    arrays hold more bytes than the data limit, is a DataError naming it (and the array)."""
    limit = read_limits().data_bytes
    try:
        with zipfile.ZipFile(path) as archive:
            members = [m for m in archive.infolist() if not m.is_dir()]
            if sum(m.file_size for m in members) > limit:
                raise DataError(path, None, None, f"its arrays inflate to more than {limit:,} bytes "
                                "(COLLABALIGN_MAX_DATA_BYTES)")
            return {m.filename.removesuffix(".npy"): _array(archive, m, path) for m in members}
    except DataError:
        raise
    except OSError as err:
        raise unreadable(path, err) from None
    except (zipfile.BadZipFile, EOFError, ValueError) as err:
        raise DataError(path, None, None, f"not a whole .npz of plain arrays ({err})") from None


def _array(archive: zipfile.ZipFile, member: zipfile.ZipInfo, path: str | Path) -> np.ndarray:
    """One member's array, after checking that the shape its header declares fits in the member's bytes."""
    with archive.open(member) as f:
        version = npy.read_magic(f)
        if version not in _HEADERS:
            raise DataError(path, None, None, f"array {member.filename!r}: .npy format {version}, not 1.0 or 2.0")
        shape, _, dtype = _HEADERS[version](f)
    if dtype.hasobject:
        raise DataError(path, None, None, f"array {member.filename!r}: Python objects, not plain numbers")
    if int(np.prod(shape, dtype=object)) * dtype.itemsize > member.file_size:
        raise DataError(path, None, None, f"array {member.filename!r}: its header declares {shape}, more than its "
                        f"{member.file_size:,} bytes hold")
    with archive.open(member) as f:
        return npy.read_array(f, allow_pickle=False)
