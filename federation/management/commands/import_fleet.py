"""``manage.py import_fleet inventory.csv --operator cucc --hub nx --site Zhongwei``: bulk onboarding.

Thin: reads the file, calls federation.fleet_import.fleet_import, prints the summary (or the per-line
errors, exiting 1). See that module for the rules.
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from core.errors import DomainError
from core.models import Organisation
from core.types import Actor
from federation.errors import FleetImportError
from federation.fleet_import import DEFAULT_NODES_PER_ISLAND, FleetImportResult, fleet_import
from federation.models import Fabric

MAX_PRINTED_ERRORS = 50


class Command(BaseCommand):
    help = (
        "Import a fleet inventory CSV (one row per node: model, card count, node name; optional hub, site, "
        "cluster, island, fabric columns) into clusters and islands of an operator. All or nothing."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("path", help="The CSV file, or - for standard input.")
        parser.add_argument("--operator", required=True, help="The operator organisation's slug.")
        parser.add_argument(
            "--hub", help="Hub code for rows without a hub column value (jjj, yrd, ..., ext)."
        )
        parser.add_argument("--site", help="Site for rows without a site column value.")
        parser.add_argument("--cluster-prefix", default="", help="Prefix of derived cluster names.")
        parser.add_argument(
            "--nodes-per-island",
            type=int,
            default=DEFAULT_NODES_PER_ISLAND,
            help=f"Nodes per island (default {DEFAULT_NODES_PER_ISLAND}: one IB/RoCE leaf-spine pod).",
        )
        parser.add_argument(
            "--fabric", choices=Fabric.values, help="Fabric of every island (default: from the chip)."
        )
        parser.add_argument(
            "--allow-unknown-models",
            action="store_true",
            help="Add models missing from the catalog as 'unknown' entries without figures.",
        )
        parser.add_argument("--dry-run", action="store_true", help="Validate and report; write nothing.")
        parser.add_argument("--json", action="store_true", help="Print the result as JSON.")

    def handle(self, *args: Any, **options: Any) -> None:
        operator = Organisation.objects.filter(slug=options["operator"]).first()
        if operator is None:
            raise CommandError(f"No organisation {options['operator']!r}.")
        path = options["path"]
        if path == "-":
            content, source_name = sys.stdin.buffer.read(), "stdin"
        else:
            try:
                content = Path(path).read_bytes()
            except OSError as exc:
                raise CommandError(f"Cannot read {path}: {exc.strerror}.") from exc
            source_name = Path(path).name

        started = time.perf_counter()
        try:
            result = fleet_import(
                actor=Actor.system("manage.py import_fleet"),
                operator=operator,
                content=content,
                hub=options["hub"],
                site=options["site"],
                cluster_prefix=options["cluster_prefix"],
                nodes_per_island=options["nodes_per_island"],
                fabric=options["fabric"],
                allow_unknown_models=options["allow_unknown_models"],
                dry_run=options["dry_run"],
                source_name=source_name,
            )
        except FleetImportError as exc:
            if options["json"]:
                body = {"code": exc.code, "message": exc.message, "extra": exc.extra}
                self.stdout.write(json.dumps(body, indent=2))
            else:
                self._print_errors(exc)
            raise CommandError(exc.message) from exc
        except DomainError as exc:
            details = f" {json.dumps(exc.extra, default=str)}" if exc.extra else ""
            raise CommandError(f"{exc.code}: {exc.message}{details}") from exc
        elapsed = time.perf_counter() - started

        if options["json"]:
            self.stdout.write(json.dumps({**asdict(result), "seconds": round(elapsed, 3)}, indent=2))
            return
        self._print(result, elapsed)

    def _print_errors(self, exc: FleetImportError) -> None:
        errors = exc.extra["errors"]
        for error in errors[:MAX_PRINTED_ERRORS]:
            where = f"line {error['line']}" if error["line"] is not None else "file"
            self.stderr.write(f"{where}: {error['code']}: {error['message']}")
        if exc.extra["error_count"] > MAX_PRINTED_ERRORS:
            by_code = Counter(error["code"] for error in errors)
            listed = ", ".join(f"{code} {count}" for code, count in by_code.most_common())
            self.stderr.write(
                f"... {exc.extra['error_count']} errors in all; of the first {len(errors)}: {listed}. "
                "Use --json for the list."
            )

    def _print(self, result: FleetImportResult, elapsed: float) -> None:
        verb = "Would import" if result.dry_run else "Imported"
        self.stdout.write(
            f"{verb} {result.nodes} nodes, {result.cards} cards for {result.operator} in {elapsed:.2f} s: "
            f"{result.clusters_created} clusters created ({result.islands_created} islands), "
            f"{result.clusters_unchanged} unchanged; {result.skipped_nodes} nodes without cards skipped."
        )
        for model in result.models:
            self.stdout.write(
                f"  {model.accelerator:<32} {model.cards:>8} cards {model.nodes:>7} nodes "
                f"{model.islands:>6} islands {model.clusters:>4} clusters"
            )
        for cluster in result.clusters:
            self.stdout.write(
                f"  {cluster.outcome:<9} {cluster.cpi}  {cluster.cards} cards in {cluster.islands} islands"
            )
        if result.accelerators_created:
            created = ", ".join(result.accelerators_created)
            self.stdout.write(
                f"  catalog entries {'to create' if result.dry_run else 'created'} (unknown spec): {created}"
            )
        for warning in result.warnings:
            where = f"line {warning.line}" if warning.line is not None else "file"
            self.stdout.write(self.style.WARNING(f"  {where}: {warning.code}: {warning.message}"))
        if result.warning_count > len(result.warnings):
            self.stdout.write(self.style.WARNING(f"  ... {result.warning_count} warnings in all."))
        if result.dry_run:
            self.stdout.write("Dry run: nothing was written.")
