from django.apps import AppConfig


class ProposalsConfig(AppConfig):
    name = "proposals"
    verbose_name = "Proposals and reviews"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from proposals import permissions  # noqa: F401  (registers the rules)
