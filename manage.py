#!/usr/bin/env python
"""Django's command-line utility for Cardhour."""

import sys

from config.entrypoint import use_settings


def main() -> None:
    use_settings()  # production unless DJANGO_SETTINGS_MODULE says otherwise (config/entrypoint.py)
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
