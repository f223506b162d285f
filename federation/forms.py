"""Portal forms of federation: the fleet inventory upload."""

from __future__ import annotations

from typing import Any

from django import forms
from django.core.files.uploadedfile import UploadedFile
from django.core.validators import RegexValidator
from django.utils.translation import gettext_lazy as _

from federation.fleet_import import DEFAULT_NODES_PER_ISLAND, MAX_NODES_PER_ISLAND, MAX_PREFIX_LENGTH
from federation.identifiers import HUB_CODES
from federation.models import Fabric
from federation.selectors import hub_list

# The portal takes inventories up to 2 MB (about 30,000 node rows); larger fleets go through the API,
# which streams up to CARDHOUR_FLEET_IMPORT_MAX_ROWS rows.
MAX_UPLOAD_BYTES = 2 * 1024 * 1024


class FleetImportForm(forms.Form):
    file = forms.FileField(
        label=_("Inventory CSV"),
        help_text=_("UTF-8, one line per node, a header line first. At most 2 MB."),
        widget=forms.ClearableFileInput(attrs={"accept": ".csv,text/csv"}),
    )
    hub = forms.ChoiceField(
        label=_("Hub"),
        required=False,
        help_text=_("For rows without a value in a hub column."),
    )
    site = forms.CharField(
        label=_("Site"),
        required=False,
        max_length=100,
        help_text=_("For rows without a value in a site column, e.g. Zhongwei."),
    )
    cluster_prefix = forms.CharField(
        label=_("Cluster name prefix"),
        required=False,
        max_length=MAX_PREFIX_LENGTH,
        validators=[
            RegexValidator(
                r"^[a-z0-9](?:[a-z0-9-]*[a-z0-9])?$",
                _("Lower-case letters, digits and inner hyphens only."),
            )
        ],
        help_text=_("Put in front of derived cluster names, e.g. “cu” gives cu-zhongwei-a800-sxm4-80gb."),
    )
    nodes_per_island = forms.IntegerField(
        label=_("Nodes per island"),
        min_value=1,
        max_value=MAX_NODES_PER_ISLAND,
        initial=DEFAULT_NODES_PER_ISLAND,
        help_text=_(
            "Nodes of a cluster are grouped in file order into islands of at most this many nodes, unless an "
            "island column names them. 32 nodes is one InfiniBand/RoCE leaf-spine pod."
        ),
    )
    fabric = forms.ChoiceField(
        label=_("Fabric"),
        required=False,
        choices=[("", _("From the chip (default)")), *Fabric.choices],
        help_text=_(
            "For islands without a fabric column value. By default: the chip's own fabric for one node; "
            "InfiniBand joins several nodes of NVLink chips, RoCE several nodes of HCCS chips."
        ),
    )
    allow_unknown_models = forms.BooleanField(
        label=_("Add models the catalogue does not know"),
        required=False,
        help_text=_(
            "Otherwise an unknown model is an error. An added model has no published figures, so buyers "
            "asking for minimum TFLOPS or memory will not be offered it."
        ),
    )
    dry_run = forms.BooleanField(
        label=_("Check only (dry run)"),
        required=False,
        help_text=_("Validate the file and show what would be created, without writing anything."),
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        hubs = [(h.code, str(h)) for h in hub_list() if h.code in HUB_CODES]
        self.fields["hub"].choices = [("", _("From the hub column")), *hubs]  # type: ignore[attr-defined]

    def clean_file(self) -> UploadedFile:
        upload: UploadedFile = self.cleaned_data["file"]
        size = upload.size or 0
        if size > MAX_UPLOAD_BYTES:
            raise forms.ValidationError(
                _(
                    "The file is %(size)s MB; the portal takes at most 2 MB. Split the inventory, or send "
                    "it to the fleet-import API, which takes larger files."
                ),
                code="too_large",
                params={"size": f"{size / 1024 / 1024:.1f}"},
            )
        return upload
