from django.core.wsgi import get_wsgi_application

from config.entrypoint import use_settings

use_settings()  # production unless DJANGO_SETTINGS_MODULE says otherwise (config/entrypoint.py)
application = get_wsgi_application()
