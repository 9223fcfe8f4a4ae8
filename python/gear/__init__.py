"""gear for Python: the rank's world and collectives (init), replay tables
over shared-memory shards (Table, Writer) and the parameter service
(Publisher, Reader), over libgear's C ABI. See docs/python.md."""

from ._lib import Closed, Error, InvalidArgument, Timeout
from .params import Publisher, Reader
from .table import Column, Pending, Sample, Table, Writer, table_spec
from .world import World, init, segment_name

__all__ = ["Closed", "Column", "Error", "InvalidArgument", "Pending", "Publisher", "Reader", "Sample",
           "Table", "Timeout", "World", "Writer", "init", "segment_name", "table_spec"]
