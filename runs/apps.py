from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "runs"
    verbose_name = "Recipes, plans and runs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from runs import permissions  # noqa: F401  (registers the rules)
