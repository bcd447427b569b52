"""SPEC §11: an approval records whether its door can run an edited input (an ACP agent
answers only with an option id); the rows already stored keep today's meaning (it can)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("delegation", "0015_preset_approvals")]

    operations = [
        migrations.AddField(
            model_name="approval",
            name="can_edit",
            field=models.BooleanField(default=True),
        ),
    ]
