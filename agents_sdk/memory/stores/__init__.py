"""Memory stores an agent attaches by name: the :class:`MemoryStore` protocol, the
registry of store types (built in: ``conversation``, ``file``, ``log``) and the
TOML/YAML config file that declares stores and attachments (docs/memory.md,
"Stores and attachments")."""

from agents_sdk.memory.stores.base import (
    STAGES,
    MemoryStore,
    Stage,
    StoreFactory,
    StoreOptions,
    StoreSpec,
    store_layer,
    validate_store_name,
)
from agents_sdk.memory.stores.config import (
    AttachmentSpec,
    ConfigFileError,
    MemoryConfig,
    load_config,
    parse_config,
)
from agents_sdk.memory.stores.conversation import ConversationOptions, ConversationStore
from agents_sdk.memory.stores.file import FileIndexReport, FileOptions, FileStore
from agents_sdk.memory.stores.log import LogOptions, LogStore
from agents_sdk.memory.stores.registry import (
    StoreType,
    build_store,
    create_store,
    register_store_type,
    store_type,
    store_types,
)

__all__ = [
    "STAGES",
    "AttachmentSpec",
    "ConfigFileError",
    "ConversationOptions",
    "ConversationStore",
    "FileIndexReport",
    "FileOptions",
    "FileStore",
    "LogOptions",
    "LogStore",
    "MemoryConfig",
    "MemoryStore",
    "Stage",
    "StoreFactory",
    "StoreOptions",
    "StoreSpec",
    "StoreType",
    "build_store",
    "create_store",
    "load_config",
    "parse_config",
    "register_store_type",
    "store_layer",
    "store_type",
    "store_types",
    "validate_store_name",
]
