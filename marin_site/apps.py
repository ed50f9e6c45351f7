"""The admin app, with the site's own admin site (``marin_site/admin.py``)."""

from django.contrib.admin.apps import AdminConfig


class SiteAdminConfig(AdminConfig):
    default_site = "marin_site.admin.SiteAdmin"
