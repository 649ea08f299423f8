#!/usr/bin/perl

# A request on a child quota is decided by its whole chain: the parent rejects and
# $yarl_quota names the parent, in a header and in the access log.

use warnings;
use strict;

use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Test::Yarl qw(http_get status_of header_of);

my $t = Test::Yarl->new();
$t->run_root('A');
$t->put_quota('bucket_all', 0.01, 5, 5);
$t->put_quota('bucket_a', 0.01, 1000, 1000, 'bucket_all');
$t->put_quota('bucket_b', 0.01, 1000, 1000, 'bucket_all');
$t->write_file('index.html', "hello\n");
$t->write_http_conf(<<'EOF2', workers => 1);
    yarl_roots %%ROOT_A%%;
    yarl_sync_interval 100ms;
    log_format yarl '$arg_b $status $yarl_status $yarl_quota';
    server {
        listen 127.0.0.1:%%PORT_8080%%;
        root %%TESTDIR%%;
        access_log %%TESTDIR%%/yarl.log yarl;
        add_header X-Yarl-Quota $yarl_quota always;
        location /acct/ { alias %%TESTDIR%%/; yarl_account "bucket_$arg_b"; }
        location /chk/ { alias %%TESTDIR%%/; yarl_check "bucket_$arg_b"; }
        location = /stats { access_log off; yarl_stats; }
    }
EOF2
$t->run();
my $p = $t->port(8080);
ok($t->wait_quota($p, 'bucket_b', 5), 'quotas arrived');
ok($t->wait_for(sub { ($t->stats($p, '/stats?quota=bucket_b')->{quota}{parent} // '') eq 'bucket_all' }, 3),
	'parent link known');

# Children a and b share the parent's 5 (+1 at F=low) units.
my @s = map { status_of(http_get($p, '/acct/index.html?b=' . ($_ % 2 ? 'a' : 'b'))) } 1 .. 6;
is_deeply(\@s, [(200) x 6], 'children pass while the parent has room');

my $r = http_get($p, '/acct/index.html?b=a');
is(status_of($r), 429, 'child rejected by the parent');
is(header_of($r, 'X-Yarl-Quota'), 'bucket_all', '$yarl_quota names the parent');
$r = http_get($p, '/chk/index.html?b=b');
is(status_of($r), 429, 'sibling check rejected by the parent');
is(header_of($r, 'X-Yarl-Quota'), 'bucket_all', 'sibling: $yarl_quota names the parent');

my $child = $t->stats($p, '/stats?quota=bucket_a')->{quota};
# 3 units, less what 0.01/s drained since.
ok(abs($child->{fill} - 3) < 0.01, "the rejected request added nothing to the child: $child->{fill}");

$t->finish();
like($t->read_file('yarl.log'), qr/^a 429 REJECTED bucket_all$/m, 'access log names the parent');
like($t->read_file('error.log'), qr/\[error\] .*limiting requests by quota "bucket_all", fill 6\.000/,
	'rejection logged with the parent');
done_testing();
