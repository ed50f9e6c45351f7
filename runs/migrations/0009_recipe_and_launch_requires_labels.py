from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0008_merge_pools_agents_and_tracker_doors"),
    ]

    operations = [
        migrations.AddField(
            model_name="recipe",
            name="requires_labels",
            field=models.JSONField(
                blank=True,
                default=list,
                help_text=(
                    "Labels a pool must have to run it (its own, or all of one agent's), e.g. "
                    "gpu:a5000; empty: any pool."
                ),
            ),
        ),
        migrations.AddField(
            model_name="planlaunch",
            name="requires_labels",
            field=models.JSONField(
                blank=True,
                default=list,
                help_text=(
                    "The labels the recipe required at launch: only agents having them lease "
                    "its runs."
                ),
            ),
        ),
    ]
