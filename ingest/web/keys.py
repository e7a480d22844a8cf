"""The application's typed keys (aiohttp ``web.AppKey``), shared by the app factory and handlers."""

from __future__ import annotations

from aiohttp import web

from ingest.auth import InstanceRateLimiter, TokenBook
from ingest.budget import MemoryBudget
from ingest.config import Settings
from ingest.core import Core
from ingest.metrics import IngestMetrics
from ingest.db.reader import Reader
from ingest.db.seqindex import StreamIndex
from ingest.db.tailcache import TailCache
from ingest.db.writer import Writer

SETTINGS = web.AppKey("settings", Settings)
CORE = web.AppKey("core", Core)
DB = web.AppKey("db", Reader)  # the one door for reads
WRITER = web.AppKey("writer", Writer)
INDEX = web.AppKey("index", StreamIndex)
TAIL = web.AppKey("tail", TailCache)
METRICS = web.AppKey("metrics", IngestMetrics)
TOKENS = web.AppKey("tokens", TokenBook)
LIMITER = web.AppKey("limiter", InstanceRateLimiter)
OTLP_GRPC_PORT = web.AppKey("otlp_grpc_port", int)  # the bound port (the setting may say 0: any)
BUDGET = web.AppKey("budget", MemoryBudget)  # the memory that requests in flight may hold
ENROLL_LIMITER = web.AppKey("enroll_limiter", InstanceRateLimiter)  # registrations per enrollment token
OTLP_MESSAGE = web.RequestKey("otlp_message", object)  # the OTLP request (or this node's part), parsed by forward.py
