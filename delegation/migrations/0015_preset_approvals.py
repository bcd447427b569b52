"""SPEC §11: a registered preset carries the approval policy its runs start with."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("delegation", "0014_model_prices")]

    operations = [
        migrations.AddField(
            model_name="extensionpreset",
            name="approvals",
            field=models.JSONField(blank=True, null=True),
        ),
    ]
