"""Usage-history partitions on PostgreSQL: list them, create the coming months, detach a closed month.

    manage.py usage_partitions                    # list partitions and their estimated rows
    manage.py usage_partitions --ensure           # what the daily beat does (idempotent)
    manage.py usage_partitions --detach 2026-01   # detach January 2026 of records and segments (kept as tables)
    manage.py usage_partitions --detach 2026-01 --drop   # ... and drop them (archive them first)

See metering.services.partitions for the rules a month must meet before it can leave.
"""

from __future__ import annotations

from datetime import date
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from metering.errors import PartitionNotRetainableError
from metering.services import partitions


class Command(BaseCommand):
    help = "List, create ahead, or detach (retention) the monthly partitions of usage records and segments."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--ensure", action="store_true", help="Create the missing months (the beat's job)."
        )
        parser.add_argument("--detach", metavar="YYYY-MM", help="Detach this closed month of both tables.")
        parser.add_argument(
            "--drop", action="store_true", help="With --detach: drop the detached tables too."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["detach"]:
            try:
                month = date.fromisoformat(f"{options['detach']}-01")
            except ValueError as exc:
                raise CommandError(f"--detach takes YYYY-MM, not {options['detach']!r}.") from exc
            try:
                names = partitions.usage_partition_detach(month=month, drop=options["drop"])
            except PartitionNotRetainableError as exc:
                raise CommandError(str(exc)) from exc
            verb = "Dropped" if options["drop"] else "Detached (archive, then DROP TABLE)"
            self.stdout.write(f"{verb}: {', '.join(names)}")
            return
        if options["ensure"]:
            created = partitions.usage_partitions_ensure()
            self.stdout.write(
                f"Created: {', '.join(created)}" if created else "Every month is there already."
            )
        for partition in partitions.usage_partitions_list():
            label = f"{partition.month:%Y-%m}" if partition.month else "default"
            self.stdout.write(f"{partition.name:<40} {label:>8} ~{partition.rows_estimate:,} rows")
