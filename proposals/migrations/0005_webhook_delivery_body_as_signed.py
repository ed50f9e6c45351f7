"""Deliveries keep their body as GitHub signed it, as text (it was jsonb, parsed on arrival).

Rows stored before this keep jsonb's rendering of their payload (same JSON, not the same
bytes). On PostgreSQL built with lz4 the column is compressed with it: the bodies are
10-60 kB of JSON, and lz4 costs the webhook's INSERT less CPU than the default pglz.
"""

from django.db import migrations, models


def compress_with_lz4(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor != "postgresql" or connection.pg_version < 140000:
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_settings WHERE name = 'default_toast_compression' AND 'lz4' = ANY(enumvals)")
        if cursor.fetchone() is None:  # built without lz4: pglz stays
            return
        cursor.execute(
            "ALTER TABLE proposals_webhookdelivery ALTER COLUMN body SET COMPRESSION lz4"
        )


class Migration(migrations.Migration):
    dependencies = [
        ("proposals", "0004_webhook_delivery_pending_index"),
    ]

    operations = [
        migrations.RenameField(model_name="webhookdelivery", old_name="payload", new_name="body"),
        migrations.AlterField(
            model_name="webhookdelivery", name="body", field=models.TextField()
        ),
        migrations.RunPython(compress_with_lz4, migrations.RunPython.noop, elidable=True),
    ]
